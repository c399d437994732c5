from execgate.cli import main

raise SystemExit(main())
