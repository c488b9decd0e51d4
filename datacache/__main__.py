import sys

from datacache.cli import main

sys.exit(main(sys.argv[1:]))
