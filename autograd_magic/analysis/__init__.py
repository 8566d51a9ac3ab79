"""What a trace's records mean: `analyze(trace)` gives one `Analysis` (facts, derived tables)."""
