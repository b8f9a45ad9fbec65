"""The `localspec` command: main.py dispatches; one file per subcommand with add_parser() and run()."""
