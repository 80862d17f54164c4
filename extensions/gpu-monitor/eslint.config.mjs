// ESLint (flat config) for the GPU monitor's TypeScript, after the JupyterLab extension
// template's rules; formatting is prettier's (eslint-config-prettier turns off the rules
// that would fight it). `jlpm lint:check` runs both, `jlpm lint` fixes what they can.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'node_modules/',
      'lib/',
      'dist/',
      'coverage/',
      '.yarn/',
      'workbench_gpu_monitor/',
      '**/*.d.ts'
    ]
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  // before the rules below: it turns off `curly`, which the template keeps on
  prettier,
  {
    files: ['**/*.ts'],
    languageOptions: { globals: { ...globals.browser } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['warn', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      '@typescript-eslint/no-use-before-define': 'off',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  {
    files: ['style/**/*.js', '*.mjs'],
    languageOptions: { globals: { ...globals.node } }
  }
);
