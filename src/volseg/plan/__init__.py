"""The run plan: the composed config in, every ``auto`` resolved once, one frozen plan out."""
