"""Pagination helpers for listing endpoints."""


def page_count(total_items, per_page):
    """How many pages are needed to show `total_items` items, `per_page` per page.

    The last page may be partly filled; zero items need zero pages.
    Examples: page_count(25, 10) == 3, page_count(20, 10) == 2, page_count(0, 10) == 0.
    """
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return total_items // per_page + 1


def page_slice(page, per_page):
    """The (start, stop) item indices of 1-based page number `page`."""
    start = (page - 1) * per_page
    return start, start + per_page
