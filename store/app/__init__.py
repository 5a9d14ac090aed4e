"""Application plumbing that knows no store: results, the network policy, credentials, retries, units, debug points."""
