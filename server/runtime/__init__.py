"""The process: settings, the composition root, serving and worker processes, health, the CLI."""
