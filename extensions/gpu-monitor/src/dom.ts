/** Small DOM helpers shared by the views: escape, build, and change text only when it changed. */

const SVG_NS = 'http://www.w3.org/2000/svg';

export function esc(text: unknown): string {
  return String(text ?? '').replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
}

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: { [key: string]: string }
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const key of Object.keys(attrs)) {
    node.setAttribute(key, attrs[key]);
  }
  return node;
}

export function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}
