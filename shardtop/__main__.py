from shardtop.cli import main

raise SystemExit(main())
