"""get_config() files of the benchmarks (the training config schema, benchmark shapes)."""
