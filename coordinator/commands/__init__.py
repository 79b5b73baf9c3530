"""One module per ``python -m coordinator`` subcommand: ``register(subparsers)`` and ``run(args)``."""
