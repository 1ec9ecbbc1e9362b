"""Helpers every other package may use: config values, errors, units, precision, run dirs."""
