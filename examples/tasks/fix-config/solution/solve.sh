#!/bin/bash
set -e
sed -i -e 's/^port = .*/port = 8080/' -e 's/^tls = .*/tls = on/' /app/config.ini
