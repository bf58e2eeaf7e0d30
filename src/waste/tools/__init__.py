"""Offline tools around libwaste: container writer, checkpoint converter, logit eval."""
