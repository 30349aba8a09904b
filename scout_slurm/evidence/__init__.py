"""The evidence folder: the contract between all parts (layout, typed records, safe storage)."""
