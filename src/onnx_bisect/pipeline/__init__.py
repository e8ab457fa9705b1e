"""The only package that knows the order of the stages: bisect one case, against a reference file, or verify many."""
