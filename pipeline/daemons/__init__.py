"""The always-on main loops: `ctr joiner`, `ctr trainer`."""
