"""Calendar helpers."""


def is_leap(year):
    """True when `year` is a leap year in the Gregorian calendar.

    A year is a leap year if it is divisible by 4, except years divisible by 100,
    which are leap years only when they are also divisible by 400
    (2024 and 2000 are leap years; 2023 and 1900 are not).
    """
    return year % 4 == 0 and (year % 100 != 0 or year % 400 != 0)


def days_in_year(year):
    """366 for a leap year, else 365."""
    return 366 if is_leap(year) else 365
