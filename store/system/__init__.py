"""OS and format primitives that know no store: files, trees, archives, signals, host facts, JSON, TOML."""
