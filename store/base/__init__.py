"""The words every floor speaks: the error family, the progress reporter, shown text, shared defaults."""
