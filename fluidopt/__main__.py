from fluidopt.cli import entry

entry()
