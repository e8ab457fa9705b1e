"""What the rules share: graph edits, segment extraction, weight layouts."""
