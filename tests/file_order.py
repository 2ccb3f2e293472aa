"""The order the test files start in: the longest first (tests/run_files.py runs a file per
process, N at a time, so a long file started last would run alone at the end)."""

# By their time in a full `make test` (its "slowest files"); the rest in path order.
SLOW_FILES_FIRST = (
    "test_multihost.py",
    "test_configs.py",
    "test_rl_step.py",
    "test_reliability.py",
    "test_trainer.py",
    "test_knobs.py",
    "test_notebooks.py",
    "test_population.py",
    "test_ahead.py",
    "test_launch.py",
    "test_lora.py",
    "test_shared_prompt.py",
    "test_pact.py",
    "test_sources_resume.py",
    "test_ppo.py",
    "test_turns.py",
    "test_perf_paths.py",
    "test_vocab_parallel.py",
    "test_supervise.py",
)
