"""Every option of a run, its validation and the frozen RunConfig.

The command line only parses; everything here turns text into values or a
ConfigError naming the option. Imports core only, never an adapter or the runtime."""
