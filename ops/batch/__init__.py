"""`tokenmill batch`: OpenAI Batch JSONL files through the workers (plan, runner, output file, ids,
progress, summary, table)."""
