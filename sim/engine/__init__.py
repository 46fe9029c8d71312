"""Engine: one replica's SimPy loop, its arrival sources, the recorder and the decode fast-forward."""
