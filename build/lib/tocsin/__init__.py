"""Tocsin: fire each task at its timestamp, to the millisecond, exactly once."""
