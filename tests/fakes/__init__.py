"""Fakes for tests: real processes and sockets on loopback that stand in for what cannot run here."""
