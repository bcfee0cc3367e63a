"""Backends and the registry that maps a config's backend name to one."""
