"""Cluster-wide class state: per-class additive statistics shared through Redis."""

from gateway.state.deltas import ClassSnapshot
from gateway.state.settings import ClassStateSettings
from gateway.state.store import RedisClassStore, StoreStats, StoreStatus

__all__ = ["ClassSnapshot", "ClassStateSettings", "RedisClassStore", "StoreStats", "StoreStatus"]
