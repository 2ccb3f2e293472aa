"""The top layer: the config schema (composed from each section's defaults and checks), presets,
building a run's parts from a config, the trainer loop and the command line. The only layer
that reads a whole `ConfigDict`."""
