"""The command line: entry, flags, commands, tables and plots."""
