"""The store model: what a store is on disk and in its index (keys, names, layout, manifest, index, Store)."""
