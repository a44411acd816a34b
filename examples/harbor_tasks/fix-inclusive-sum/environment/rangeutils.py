"""Small helpers for integer ranges."""


def range_sum(a, b):
    """Return a + (a + 1) + ... + b, the sum of the integers from a to b inclusive.

    Both ends are included: range_sum(1, 3) == 6 and range_sum(5, 5) == 5.
    When a > b the range is empty and the sum is 0.
    """
    total = 0
    for i in range(a, b):
        total += i
    return total


def range_len(a, b):
    """How many integers lie between a and b inclusive (0 when a > b)."""
    return max(0, b - a + 1)
