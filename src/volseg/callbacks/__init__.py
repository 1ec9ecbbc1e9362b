"""Lightning callbacks that are not about memory (the memory monitor is in ``volseg.memory``)."""
