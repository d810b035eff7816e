import sys

from pdmux_triton.cli import main

sys.exit(main())
