"""Adapters: one per technology (the fake engine, libwaste through cffi, HTTP, images)."""
