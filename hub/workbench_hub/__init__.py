"""Hub-side pieces of GPU Workbench that are not the spawner."""
