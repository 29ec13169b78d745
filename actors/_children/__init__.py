"""_children"""
