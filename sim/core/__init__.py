"""Core: the leaves every layer shares: requests, batch summaries, step plans, protocols, errors."""
