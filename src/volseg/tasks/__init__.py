"""What the entry points run (``train.py`` -> ``train.train`` ...); they import every other
package, nothing imports them."""

__all__ = ["estimate_memory", "evaluate", "predict", "train"]
