"""Sweeps: the state jobs share (`state`) and the Hydra callback that sets it up (`callback`)."""
