"""Tests of wdsmp.fast, the FastLoader."""
