from execgate.cli import entry

entry()
