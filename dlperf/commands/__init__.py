"""Click commands, one module per command family; `dlperf.cli` registers them lazily."""
