"""`python -m rewheel` runs the command-line interface."""

from rewheel.cli import main

if __name__ == "__main__":
    main()
