"""What the entry points run; nothing imports this package."""
