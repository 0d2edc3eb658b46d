"""Named GPU profiles (``profiles.toml``), raw iteration-time measurements (``*.csv``) and the
profiler that measures them. Installed as the ``fluidopt.profiles`` package; see README.md here."""
