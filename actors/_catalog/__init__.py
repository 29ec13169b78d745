"""_catalog"""
