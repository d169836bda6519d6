"""What a run reports: metrics.jsonl and the progress line, the summary, trackers, each rank's
log."""
