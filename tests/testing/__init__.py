"""Tests of the public pytest plugin (`convprobe.testing`)."""
