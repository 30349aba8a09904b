"""placeholder until implemented: exits 0 so a lab node is never drained by it."""
import sys

def main() -> int:
    return 0

if __name__ == "__main__":
    sys.exit(main())
