from execgate.console import entry

entry()
