"""Cost models (a plug-in layer): the GPU and model catalogues, calibration profiles, step pricing."""
