"""EvSpark."""
