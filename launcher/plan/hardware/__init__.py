"""The accelerators: the GPU catalog and its lookup, measured profiles (llmtrain calibrate) and
their noise."""
