#!/bin/sh
echo "extracting $1"
