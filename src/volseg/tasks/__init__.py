"""What the entry points run: ``train``, ``evaluate``, ``predict``, ``run_estimate``."""
