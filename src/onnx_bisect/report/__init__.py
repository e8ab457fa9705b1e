"""Report stage: the terminal text, the JSON document, the verification matrix, progress lines."""
